"""`lmscope report`: one self-contained HTML page (and a Markdown twin) of lmscope results."""
