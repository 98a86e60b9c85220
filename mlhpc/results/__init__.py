"""What runs produced: the results store and its tables (store, compare), seed-to-seed spread
(variability) and where each run's time went (report)."""
