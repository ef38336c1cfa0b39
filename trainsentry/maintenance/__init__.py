"""Maintenance windows: what a window is (types.py), how a request becomes one (windows.py)
and which alerts it matches when (match.py). Pure. The gateway mutes by them
(gateway/policy/maintenance_mutes.py, stages/services/maintenance.py, api/maintenance.py);
their rows are in store/maintenance_windows.py."""
