"""The tables and pictures of results: what the CLI prints and what a result shows in a notebook."""
