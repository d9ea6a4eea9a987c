import torch

from satrl.training.advantages import group_advantages


def test_group_advantages_hand_values():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    adv = group_advantages(rewards, groups, std_norm=False)
    torch.testing.assert_close(adv, torch.tensor([2 / 3, -1 / 3, -1 / 3, -2 / 3, 1 / 3, 1 / 3]))
    std = (torch.tensor([2 / 3, -1 / 3, -1 / 3]).square().mean()).sqrt()
    torch.testing.assert_close(group_advantages(rewards, groups)[:3], adv[:3] / (std + 1e-6))


def test_uniform_group_gets_zero_advantage():
    adv = group_advantages(torch.ones(4), torch.zeros(4, dtype=torch.long))
    assert torch.equal(adv, torch.zeros(4))
