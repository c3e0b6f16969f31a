"""Chapter 2, autograd and detach (notebooks/02_autograd.ipynb): pitfalls, exercises and fixtures."""
