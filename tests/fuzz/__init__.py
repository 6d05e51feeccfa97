"""Property-based fuzz targets for every untrusted input (see ``targets.py``)."""
