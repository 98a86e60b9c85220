"""`mlhpc characterize`: why a system trains as fast as it does, level by level (analytic, operators,
memory, roofline, I/O and distributed), written as one JSON and one self-contained page."""
