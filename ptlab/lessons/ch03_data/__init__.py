"""Chapter 3, Dataset and DataLoader (notebooks/03_data.ipynb): pitfalls, exercises and fixtures."""
