"""A user's Keras model and loss for `python -m hvdtrain.tf --model FILE.py:FUNCTION --loss FILE.py:FUNCTION`
(tests/test_tf_own_model.py): functions of no arguments returning the model, and loss(y_true, y_pred)."""
import keras


def small_cnn():
    return keras.Sequential([keras.layers.Input((16, 16, 3)), keras.layers.Conv2D(8, 3, activation="relu"),
                             keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])


def four_outputs():
    return keras.Sequential([keras.layers.Input((16, 16, 3)), keras.layers.Flatten(), keras.layers.Dense(4)])


def cross_entropy(y_true, y_pred):
    return keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)
