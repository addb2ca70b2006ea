"""The machine the server runs on: GPU snapshots (nvidia-smi in its three formats) and the
ports of this host.

In: nvidia-smi text or a run of it, /proc. Out: `DeviceSnapshot`, port holders.
"""
