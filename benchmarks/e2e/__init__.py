"""End-to-end experiment of issue 7: a real target/drafter pair, a serving loop with the runtime's
mechanics, the toolkit's pipeline on that deployment, and static-vs-dynamic goodput.

Entry point: ``python3 benchmarks/e2e/run.py --out DIR`` (``--tiny`` for the CPU smoke run).
"""
