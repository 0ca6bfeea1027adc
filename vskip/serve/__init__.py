"""``vskip serve``: an OpenAI-compatible HTTP server over the batched decode loop.

:mod:`~vskip.serve.protocol` reads requests and turns a request's ``vskip`` object into decode
settings; :mod:`~vskip.serve.engine` is the worker thread that drives the loop with continuous
batching; :mod:`~vskip.serve.metrics` holds the Prometheus metrics; :mod:`~vskip.serve.app` is the
FastAPI application and :mod:`~vskip.serve.run` opens and runs it under uvicorn.
"""
