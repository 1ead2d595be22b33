"""When and how local SGD's workers average: the rules of a round, free of Keras."""
