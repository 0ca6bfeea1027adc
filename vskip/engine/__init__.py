"""The engine: what decodes one prompt, and nothing that studies or scores it.

- ``policy/``: the paper's scheduler as pure functions (acceptance rules, signals, gates, guards,
  the prefix scheduler's decision), numpy only.
- ``models/``: the drafter and verifier behind small protocols (token ids in, blocks and
  distributions out), their loading, the embedded default pair and device placement.
- ``decode.py``: the decode loop of Figure 2 (draft, schedule, verify or skip, commit);
  ``metrics.py``: the agreement metrics of §3.2 and pass@k; ``features.py``: the A.7 inputs of
  the learned signals; ``runtime.py``: devices, dtypes and threads; ``prompting.py``: a request
  in the verifier's chat template.

It may import the root modules (``defaults``, ``environment``, ``files``) and nothing else of
vskip: benchmarks, studies, reports and the command line build on it, never the reverse.
"""
