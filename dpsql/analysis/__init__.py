"""What analysts and admins run on released data: fidelity reports, combining rules."""
