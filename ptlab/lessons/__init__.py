"""Lesson material, one folder per chapter (chNN_<notebook slug>): its pitfalls, exercises and fixtures.

Lessons import the tools and the course machinery; nothing outside ptlab/lessons imports a lesson by name
(the registries find `pitfalls*.py` and `exercises.py` here on disk).
"""
