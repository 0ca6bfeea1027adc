"""The C structures of ``kernels.cpp`` as ctypes sees them, and the signatures of its entry points."""

from __future__ import annotations

import ctypes as C


class QMat(C.Structure):
    _fields_ = [("q", C.c_void_p), ("d", C.c_void_p), ("m", C.c_void_p),
                ("N", C.c_int32), ("K", C.c_int32), ("offset", C.c_int32), ("nibbles", C.c_int32)]


class Layer(C.Structure):
    _fields_ = [("attn_norm", C.c_void_p), ("qkv", QMat), ("qkv_bias", C.c_void_p), ("o", QMat),
                ("ffn_norm", C.c_void_p), ("gate_up", QMat), ("down", QMat),
                ("q_norm", C.c_void_p), ("k_norm", C.c_void_p)]


class Model(C.Structure):
    _fields_ = [("n_layers", C.c_int32), ("dim", C.c_int32), ("n_heads", C.c_int32), ("n_kv", C.c_int32),
                ("head_dim", C.c_int32), ("ffn", C.c_int32), ("vocab", C.c_int32), ("rope_max", C.c_int32),
                ("eps", C.c_float), ("layers", C.POINTER(Layer)), ("final_norm", C.c_void_p),
                ("embed_f", C.c_void_p), ("embed_q", C.c_void_p), ("embed_d", C.c_void_p),
                ("head", C.POINTER(QMat)), ("rope_cos", C.c_void_p), ("rope_sin", C.c_void_p)]


def declare(lib: C.CDLL) -> C.CDLL:
    p = C.c_void_p
    lib.vs_forward.argtypes = [C.POINTER(Model), C.c_int, p, p, p, p, p, p, p, C.c_int, p, p, p, p, C.c_int, C.c_int,
                               p, p]
    lib.vs_forward.restype = C.c_int
    lib.vs_matmul.argtypes = [C.POINTER(QMat), C.c_int, p, p, C.c_int]
    lib.vs_matmul.restype = C.c_int
    lib.vs_isa.argtypes = []
    lib.vs_isa.restype = C.c_char_p
    return lib
