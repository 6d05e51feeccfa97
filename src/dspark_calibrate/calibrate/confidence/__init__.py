"""confidence stage of the calibration pipeline (see the package docstring)."""
