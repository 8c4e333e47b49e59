"""Communication per step: the calls each framework issues (`calls`) and their bytes and times
(`estimate`)."""
