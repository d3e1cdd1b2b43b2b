"""What analysts and admins run on released data: fidelity reports, Rubin's combining rules."""
