"""What a person sees: tables that fit the terminal, words a browser must not break, figures,
the note a slow step prints, and where log records go.

May import: the words at common/'s top, safeio (figures are written whole) and cluster (only
the first rank prints).
"""
