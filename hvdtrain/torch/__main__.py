from hvdtrain.torch.train import main

main()
