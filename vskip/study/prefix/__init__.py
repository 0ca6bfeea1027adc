"""The prefix scheduler beyond the paper, apart from its pure decision
(:mod:`vskip.engine.policy.prefix`, which the loop calls): the survival model trained per fold
rotation and the thresholds it loads (``model.py``), and their calibration, on Strict SDD traces
or online on the policy's own decodes (``calibrate.py``, with the online calibration's prompt ids,
sweeps and finished thresholds in ``online.py``)."""
