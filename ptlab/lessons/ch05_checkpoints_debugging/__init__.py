"""Chapter 5, checkpoints and debugging (notebooks/05_checkpoints_debugging.ipynb): pitfalls, exercises and fixtures."""
