"""Chapter 8, torch.compile and export (notebooks/08_compile_export.ipynb): pitfalls, exercises and fixtures."""
