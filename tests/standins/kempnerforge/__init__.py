"""Stand-in for KempnerForge in kforge's tests (see tests/standins/README.md)."""
