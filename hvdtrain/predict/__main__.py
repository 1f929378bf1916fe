from hvdtrain.predict.cli import main

main()
