"""Chapter 4, training a CNN (notebooks/04_cnn_training.ipynb): pitfalls, exercises and fixtures."""
