"""Imported by a test config (``custom_imports``) in the doctor's probe
ranks: breaks the doctor's own set-up of the probe (its estimate of DDP's
first gradient bucket), where a real launch runs nothing of it."""
from mmddp_ext.doctor import probe

probe.FIRST_BUCKET_BYTES = None  # size >= None: TypeError
