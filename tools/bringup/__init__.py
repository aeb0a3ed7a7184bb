"""Loom's GPU bring-up (tools/gpu_bringup.py, tools/gpu_bringup.sh): a registry of steps with
time budgets (registry), the call's settings, clock and commands (context), the results file
(results), one module per group of steps, and the command line (driver)."""
