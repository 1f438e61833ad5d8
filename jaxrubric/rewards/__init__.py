"""Generator rewards for DynamicRubric and GenRubric."""
