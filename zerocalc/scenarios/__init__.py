"""Scenarios (a request as TOML) and `zerocalc check`: their results against committed expectations."""
