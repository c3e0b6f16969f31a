"""Chapter 1, tensors and broadcasting (notebooks/01_tensors.ipynb): pitfalls, exercises and fixtures."""
