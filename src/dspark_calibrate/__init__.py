"""dspark-calibrate: measure, calibrate, sign and guard DSpark dynamic-verification evidence.

Subpackages (imports point down only, see DESIGN §3):

- ``schemas``: Arrow and JSON schemas, the logical-hash specification.
- ``artifacts``: canonical JSON, logical hash, Parquet I/O, DSSE signing, trust root, verification.
- ``calibrate``: the sweep harness, statistics, confidence calibration, workload replay.
- ``runtime_plugin``: live fingerprint, admission hook, reference selector, engine adapters.

Example:
    >>> import dspark_calibrate
    >>> dspark_calibrate.__version__
    '0.1.0'
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
