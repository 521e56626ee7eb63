"""Dead letters read back: reader and filters, grouping by cause, replay and its ledger."""
