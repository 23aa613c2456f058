"""`lmscope study`: the whole study as a plan of Specs, run section by section by the one runner."""
