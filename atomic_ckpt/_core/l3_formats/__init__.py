"""Layer 3: the marker format and its parser, walking a tree once, the read-only view, verify."""
