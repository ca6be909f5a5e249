"""Training tools for DSpark drafters: data regeneration, target features, anchors, losses, trainer."""
