"""Test kits users import into their own suites (provider contract)."""
