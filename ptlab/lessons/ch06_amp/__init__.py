"""Chapter 6, mixed precision (notebooks/06_amp.ipynb): pitfalls, exercises and fixtures."""
