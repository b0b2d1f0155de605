"""Intent contracts and the execution guard: contracts, scope, classification, decisions, receipts."""
