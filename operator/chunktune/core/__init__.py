"""The bottom layer: types, data and rules that every other package may import."""
