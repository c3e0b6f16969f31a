"""Test setup: tests/ on sys.path so every test folder can import notebook_rules."""
