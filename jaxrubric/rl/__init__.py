"""Reinforcement learning: GRPO advantages, losses and updates."""
