"""The study: runs, comparisons and sweeps of the decode loop on benchmarks, and what is learned
from them.

- ``runner.py`` and ``rundir.py``: one resumable run directory (config, samples, rounds);
  ``variants.py`` and ``compare.py``: configurations side by side on the same prompts;
  ``grids.py``, ``sweep.py`` and ``sweep_workers.py``: the paper's grids as resumable units.
- ``traces.py``, ``rotations.py``, ``predictor.py``: traced blocks and the learned signals of A.7,
  one model per fold rotation; ``diagnose.py``, ``ranking.py``, ``proposition1.py``: the offline
  diagnostics (§6.1, Table 1, Proposition 1).
- ``prefix/``: the prefix scheduler beyond the paper (its survival model and its calibration;
  the pure decision is ``engine/policy/prefix.py``, which the loop calls).
- ``fullscale.py``: the full-scale study's pieces (what each decodes, which runs exist, which runs
  each report sets side by side); ``jobs.py``: vskip commands run side by side until a deadline.

It may import the engine, the benchmarks and the root modules; reports and the command line
build on it.
"""
