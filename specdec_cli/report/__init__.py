"""Results files, tables and plots."""
