"""Function discovery: the explorer's walk, partition into functions, no-return inference, function records."""
