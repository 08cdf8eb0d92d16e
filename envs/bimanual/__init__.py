"""Two Franka arms across a table: the scene, batched end-effector control and a scripted grasp."""
