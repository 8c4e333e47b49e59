"""The process harness of bench and validate: spawn ranks on this node, watch them, collect rank 0's
typed result. Standard library only: no torch."""
