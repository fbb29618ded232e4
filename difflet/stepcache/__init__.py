"""Step caching, decided on the host around compiled denoisers (paper section 5).

modes.py        mode strings (off | cadence:N | online-delta[:ALPHA] | calibrated:FILE[:TH][:step|accumulate])
controller.py   output estimator + per-step full-or-cached decision (one per request)
plan.py         per-request resolved plan (mode + checked calibration), step hooks
calibration.py  curve fit, R^2, mode selection, threshold replay
calibration_file.py  the versioned file (torch-free)
calibrate.py    reference runs on a runner -> calibration data
commands.py     `difflet calibrate`
The probe program itself is built by difflet/codegen/probe.py; the loop is
difflet/runtime/host/loop.py:cached_loop. No runtime setting here reaches a compiled program.
"""
