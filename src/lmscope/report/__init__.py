"""Rendering records: terminal tables, markdown/csv/latex, plots."""
