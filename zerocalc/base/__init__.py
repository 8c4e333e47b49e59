"""The vocabulary every layer shares: errors, units and byte counts, dtypes, atomic file writes.

Imports nothing of zerocalc outside this package."""
