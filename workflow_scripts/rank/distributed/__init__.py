"""Multi-process training: process-group backends and their setup."""
