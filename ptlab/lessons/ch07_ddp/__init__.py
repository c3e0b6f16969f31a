"""Chapter 7, DistributedDataParallel (notebooks/07_ddp.ipynb): pitfalls, exercises and fixtures."""
