"""ClassAd policies of a bag (issue 3)."""
