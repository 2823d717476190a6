"""Reports: one self-contained HTML page (inline SVG, works offline) and a Markdown twin."""
