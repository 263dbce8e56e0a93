
fashion-mnist-cnnû
idx</usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz</usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz";/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz*;/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz“
cnn
conv2d (
relu
	maxpool2d
conv2d@(
relu
	maxpool2d	
flatten
linear0€
relu
dropout9333333Ó?

linear0
"8€ *-
sgdš™™™™™©?ÍÌÌÌÌÌì?!ü©ñÒMb@?*cosine0È8*:èH