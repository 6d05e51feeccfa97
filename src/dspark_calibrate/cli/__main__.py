"""``python -m dspark_calibrate.cli`` runs ``dspark-calibrate``."""

from dspark_calibrate.cli import calibrate_main

calibrate_main()
